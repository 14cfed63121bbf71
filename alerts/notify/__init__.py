"""Notifiers: turn a ``Notification`` into a Slack message, an email, an Alertmanager-format webhook
or alerts pushed to an Alertmanager's API."""
