"""The database backend the settings name for PostgreSQL (`base.DatabaseWrapper`)."""
