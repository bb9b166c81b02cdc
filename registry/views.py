"""The registry's pages. The catalog moved to dashboard/views.py."""
