"""gpuwatt web dashboard (Dash). Lands with its issue."""
