"""Routes grouped per noun: each module exports ``ROUTES`` (path, models, the verb's role, one verb call per
handler); ``app/routes.py`` adds them to the table the server, the OpenAPI document and the MCP bridge use."""
