"""The HTTP edge: routes and their decoding, validation, the admin tables and summary, the
OpenAPI document; the only place controller errors become HTTP statuses.
"""
