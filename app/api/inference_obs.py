"""REST route of the inference deployments' engine logs: one call of the inference noun's ``read_logs`` verb (the
engines' metrics ride in ``inference_get``'s answer). The MCP bridge hands the text to the agent as it is."""

from __future__ import annotations

from app.api.base import Call, Reply, Route
from app.api.inference import BASE, ONE, TAG
from services.inference import Inference
from services.inference.obs_models import InferenceLogQuery
from services.logs.models import TEXT_MAX_BYTES, TEXT_MAX_LINES
from services.verbs import role_of


def _logs(call: Call) -> Reply:
    answer = call.services.inference.read_logs(call.principal, call.path["cluster"], call.path["name"], call.query)
    return Reply(answer.text, headers={"X-Log-Cursor": answer.cursor, "X-Log-Source": answer.source,
                                       "X-Log-Earlier": str(answer.earlier)})


ROUTES: list[Route] = [
    Route("GET", BASE + "/{name}/logs", "inference_logs", "A deployment's engine logs as text (tail, grep)",
          role_of(Inference.read_logs), _logs, query=InferenceLogQuery, path_params=ONE, tag=TAG, open_world=True,
          media_type="text/plain; charset=utf-8",
          description="The last lines the vLLM / SGLang engine container wrote in each pod of the deployment (the "
                      "previous container's too after a restart: why a crash-looping engine died), oldest first, "
                      "one per line: '<UTC timestamp> <pod> <text>'. Filter with pod=, grep= (a case-insensitive "
                      "regular expression, e.g. 'error|CUDA|out of memory') and since=; at most "
                      f"{TEXT_MAX_LINES} lines and {TEXT_MAX_BYTES // 1024} KiB. The last line starts with '#' and "
                      "says what was left out and how to continue: repeat the call with its cursor= to get only "
                      "newer output (poll it to follow the log)."),
]
