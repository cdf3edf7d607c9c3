#!/usr/bin/env bash
# Rebuild the editable install in .venv (serialised: several shells may call it).
set -euo pipefail
cd "$(dirname "$0")/.."
exec flock /tmp/ringcomm-build.lock .venv/bin/pip install --no-build-isolation --no-deps -q -e . "$@"
