"""MCP bridge."""
