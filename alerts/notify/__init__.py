"""Notifiers: turn a ``Notification`` into a Slack message, an email or an Alertmanager webhook."""
