"""REST routes of the sandbox itself (info, fault injection, the call ledger), mounted only when the sandbox
runs. They act through :class:`services.sandbox_control.SandboxControl`, the same verbs its pane uses, and
are generated into the OpenAPI document and the MCP tool list like any route, so an agent can rehearse
recovery playbooks against injected faults."""

from __future__ import annotations

from typing import Any

from app.api.base import Call, Reply, Route
from app.api.pages import Page, current_principal
from app.bootstrap import Services
from services.auth import Principal
from services.sandbox_control import CallsQuery, CallView, FaultInject, FaultView, SandboxControl, SandboxInfo
from services.verbs import role_of


def sandbox_routes(control: SandboxControl) -> list[Route]:
    def info(call: Call) -> Reply:
        return Reply(control.info(call.principal))

    def list_faults(call: Call) -> Reply:
        return Reply(control.faults(call.principal))

    def inject(call: Call) -> Reply:
        return Reply(control.inject(call.principal, call.body), status=201)

    def clear(call: Call) -> Reply:
        return Reply(control.clear(call.principal, call.path["id"]))

    def calls(call: Call) -> Reply:
        return Reply(control.calls(call.principal, call.query))

    return [
        Route("GET", "/api/v1/sandbox", "sandbox_info", "Sandbox endpoints and what it simulates",
              role_of(SandboxControl.info),
              info, response=SandboxInfo, tag="sandbox",
              description="Only in sandbox mode: the AWS endpoint (aws --endpoint-url), the Kubernetes emulator "
                          "URL, the simulated operations and the clock speed."),
        Route("GET", "/api/v1/sandbox/faults", "sandbox_faults_list", "List injected sandbox faults",
              role_of(SandboxControl.faults),
              list_faults, response=FaultView, many=True, tag="sandbox"),
        Route("POST", "/api/v1/sandbox/faults", "sandbox_faults_inject", "Inject a sandbox fault",
              role_of(SandboxControl.inject),
              inject, body=FaultInject, response=FaultView, read_only=False, idempotent=False, status=201,
              tag="sandbox",
              description="Sandbox only: make a node unhealthy, a capacity or quota run out, an add-on degrade, "
                          "an AWS API throttle or an access denial, to rehearse diagnosis and recovery."),
        Route("DELETE", "/api/v1/sandbox/faults/{id}", "sandbox_faults_clear", "Clear sandbox faults",
              role_of(SandboxControl.clear),
              clear, response=FaultView, many=True, read_only=False, path_params={"id": "fault id, or 'all'"},
              tag="sandbox"),
        Route("GET", "/api/v1/sandbox/calls", "sandbox_calls", "The sandbox's call ledger",
              role_of(SandboxControl.calls), calls,
              query=CallsQuery, response=CallView, many=True, tag="sandbox",
              description="Sandbox only: every AWS call (service, operation, target, parameters with secrets "
                          "redacted, result) and Kubernetes request (verb, resource, name, watch) the sandbox "
                          "received, with time and caller, oldest first; page with since=<last seq>."),
    ]


def sandbox_pages(control: SandboxControl) -> list[Page]:
    def build(services: Services, principal: Principal) -> Any:
        from panels.sandbox import SandboxPane

        return SandboxPane(control=control, bus=services.bus, principal=principal,
                           current_principal=current_principal(services, principal))

    return [Page("sandbox", "Sandbox", role_of(SandboxControl.info), build)]
