"""The `headrace` command (services/cli/app.py assembles it). Kept empty so that importing one
command module does not load the others."""
