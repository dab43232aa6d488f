"""The config file's life: read, check, edit, keep, reload, safe mode."""
