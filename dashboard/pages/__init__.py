"""The dashboard's pages. Each module has ``PAGE`` (its id), ``PATH``, ``NAME``, ``ORDER``,
``layout(**query)`` (the skeleton, registered with ``dash.register_page``) and
``render(ctx) -> list`` (the content for one time range, called by the page's callback)."""
