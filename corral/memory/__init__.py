"""corral's memory: what became of every job (episodes with error signatures), advice
at submit time drawn from them, and notes agents and people leave for later sessions.
``store`` holds both in the gateway's database; ``signatures`` names failures; ``guard``
keeps secrets and suspected injections out of notes; ``commands`` is the CLI."""
