"""PLACEHOLDER (export-python branch): the lead's PEP 517 backend replaces this file on merge."""
