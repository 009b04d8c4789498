"""The compile report: an HTML page with SVG charts from an artifact and its tuning database."""
