"""Playbooks name only tools the bridge really offers (generated from the live route table)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from app.rest import openapi_document
from mcp_bridge.tools import tool_specs

SKILLS = Path(__file__).resolve().parents[1] / "skills"


def test_every_tool_a_playbook_names_exists() -> None:
    tools = {spec.name for spec in tool_specs(openapi_document(), "admin")}
    playbooks = [p for p in SKILLS.glob("*.md") if p.name != "README.md"]
    assert playbooks
    for path in playbooks:
        text = path.read_text()
        front = yaml.safe_load(text.split("---")[1])
        assert front["version"] >= 1 and front["name"]
        declared = set(front["tools"])
        assert declared <= tools, f"{path.name} declares unknown tools {declared - tools}"
        mentioned = set(re.findall(r"`([a-z]+_[a-z_]+)`", text))
        assert mentioned <= tools, f"{path.name} names unknown tools {mentioned - tools}"
        assert mentioned <= declared, f"{path.name} uses tools missing from its front matter {mentioned - declared}"
