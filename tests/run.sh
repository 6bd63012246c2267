#!/usr/bin/env bash
# The whole test suite from scratch: system packages (Debian chromium for the browser test), a virtual
# environment with the project and its dev extras, then lint, types, Dockerfile lint and pytest.
# Usage: bash tests/run.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "== installing Debian chromium (browser tests)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-liberation >/dev/null
  else
    echo "chromium is missing: sudo apt-get install chromium (the browser test needs it)" >&2
    exit 1
  fi
fi

if ! command -v wrk >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  echo "== installing Debian wrk (the throughput bench's smoke test)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null
fi

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
echo "== installing the project into $VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -e '.[dev,sandbox]'

# the incumbent's side of the cluster-read bench shells out to the aws CLI: its own venv, never the project's
if ! aws --version >/dev/null 2>&1; then  # (a pyenv shim may exist without an aws behind it)
  AWS_VENV=${AWS_VENV:-.venv-aws}
  if [ ! -x "$AWS_VENV/bin/aws" ]; then
    echo "== installing the aws CLI into $AWS_VENV (bench only)"
    python3 -m venv "$AWS_VENV" && "$AWS_VENV/bin/pip" install -q --disable-pip-version-check awscli
  fi
  export INSTANTSTART_BENCH_AWS="$PWD/$AWS_VENV/bin/aws"
fi

echo "== ruff";     "$VENV/bin/ruff" check .
echo "== mypy";     "$VENV/bin/mypy"
echo "== import-linter"; "$VENV/bin/lint-imports"
echo "== hadolint"; "$VENV/bin/hadolint" Dockerfile
echo "== pytest"
exec "$VENV/bin/python" -m pytest "$@"
