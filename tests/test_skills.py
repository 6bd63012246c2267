"""Playbooks name only tools the bridge really offers (generated from the live route table); a read-only
playbook (a diagnosis) uses read-only tools only, and names state-changing tools only as suggestions for a
human (its ``suggests`` list)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from app.rest import openapi_document
from mcp_bridge.tools import DEFAULT_TOOLSETS, select_toolsets, tool_specs

SKILLS = Path(__file__).resolve().parents[1] / "skills"


def _playbooks() -> list[tuple[Path, dict[str, Any], str]]:
    found = []
    for path in sorted(SKILLS.glob("*.md")):
        if path.name != "README.md":
            text = path.read_text()
            found.append((path, yaml.safe_load(text.split("---")[1]), text))
    assert found
    return found


def test_every_tool_a_playbook_names_exists() -> None:
    tools = {spec.name for spec in tool_specs(openapi_document(), "admin")}
    for path, front, text in _playbooks():
        assert front["version"] >= 1 and front["name"]
        declared = set(front["tools"])
        suggested = set(front.get("suggests") or [])
        assert declared <= tools, f"{path.name} declares unknown tools {declared - tools}"
        assert suggested <= tools, f"{path.name} suggests unknown tools {suggested - tools}"
        mentioned = set(re.findall(r"`([a-z]+_[a-z_]+)`", text))
        assert mentioned <= tools, f"{path.name} names unknown tools {mentioned - tools}"
        assert mentioned <= declared | suggested, \
            f"{path.name} uses tools missing from its front matter {mentioned - declared - suggested}"
        # what a bridge started with the playbook's toolsets (``--toolsets``, on top of the default) offers
        wanted = ",".join([*DEFAULT_TOOLSETS, *(front.get("toolsets") or [])])
        offered = {spec.name for spec in select_toolsets(tool_specs(openapi_document(), "admin"), wanted)}
        assert declared | suggested <= offered, \
            f"{path.name} needs toolsets it does not name (front matter `toolsets`): {(declared | suggested) - offered}"


def test_a_read_only_playbook_calls_read_tools_and_only_suggests_the_rest() -> None:
    specs = {spec.name: spec for spec in tool_specs(openapi_document(), "admin")}
    read_only = [(path, front) for path, front, _text in _playbooks() if front.get("read_only")]
    assert any(path.name == "diagnose-cluster-creation.md" for path, _front in read_only)
    for path, front in read_only:
        writes = sorted(t for t in front["tools"] if not specs[t].read_only)
        assert writes == [], f"{path.name} is read-only but calls {writes}: list them under suggests"
        assert all(not specs[t].read_only for t in front.get("suggests") or []), \
            f"{path.name} suggests a read tool: call it instead"
    for path, front, _text in _playbooks():
        assert not front.get("suggests") or front.get("read_only"), \
            f"{path.name}: suggestions for a human belong to read-only playbooks"
