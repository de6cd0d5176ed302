"""The live dashboard for admins and sponsors at /dashboard: board.py says what it shows,
routes.py serves the pages (server-rendered, templates/), polled for live updates."""
