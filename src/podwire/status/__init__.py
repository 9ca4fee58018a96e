"""``podwire status``: one screen with the state of every part, read from where it lives."""
