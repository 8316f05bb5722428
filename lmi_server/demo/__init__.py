"""The embedded demo model: built offline, cached, loaded like any model directory."""
