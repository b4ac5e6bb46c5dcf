#!/usr/bin/env bash
# Install Debian's headless-capable Chromium for tests/browser, unless a chromium is already there.
# Idempotent: a second run does nothing. Needs root (or sudo) and the Debian package mirrors.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends chromium
command -v chromium >/dev/null
