"""REST route of job logs as text (the live stream is the WebSocket in ``app/logsocket.py``): one call of
the logs noun's ``read_text`` verb. The MCP bridge hands the text to the agent as it is."""

from __future__ import annotations

from app.api.base import Call, Reply, Route
from services.logs import JobLogs
from services.logs.models import TEXT_MAX_BYTES, TEXT_MAX_LINES, LogTextQuery
from services.verbs import role_of

JOB = {"cluster": "name the cluster is registered under (clusters_list)",
       "job": "the training job's name (its pods carry the label instantstart.io/job=<job>)"}


def _text(call: Call) -> Reply:
    answer = call.services.logs.read_text(call.principal, call.path["cluster"], call.path["job"], call.query)
    return Reply(answer.text, headers={"X-Log-Cursor": answer.cursor, "X-Log-Source": answer.source,
                                       "X-Log-Earlier": str(answer.earlier)})


ROUTES: list[Route] = [
    Route("GET", "/api/v1/clusters/{cluster}/jobs/{job}/logs", "jobs_logs", "A job's logs as text (tail, grep)",
          role_of(JobLogs.read_text), _text, query=LogTextQuery, path_params=JOB, tag="jobs", open_world=True,
          media_type="text/plain; charset=utf-8",
          description="The last lines of a training job's pods (all pods, or one pod, container or node rank), "
                      "oldest first, one per line: '<UTC timestamp> <pod>[/<container>] <text>'. Filter with "
                      "grep= (a case-insensitive regular expression, e.g. 'error|nccl|Traceback') and since=; at "
                      f"most {TEXT_MAX_LINES} lines and {TEXT_MAX_BYTES // 1024} KiB. The last line starts with '#' "
                      "and says what was left out and how to continue: repeat the call with its cursor= to get "
                      "only newer output. Finished jobs stay readable (previous containers included); once their "
                      "pods are deleted the lines come from the archive in the shared bucket."),
]
