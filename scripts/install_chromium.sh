#!/usr/bin/env bash
# Install headless Chromium from the Debian packages, for the leaderboard HTML test
# (tests/report/test_html_chromium.py). Idempotent and quiet; run as root (or with sudo).
#
#     bash scripts/install_chromium.sh        # then: DRAFTSMITH_REQUIRE_CHROMIUM=1 pytest tests/report
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install_chromium.sh: needs root (or sudo) to apt-get install chromium" >&2
        exit 1
    fi
    SUDO="sudo"
fi
APT="$SUDO env DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get"
$APT update -qq >/dev/null
$APT install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
if [ ! -x /usr/bin/chromium ]; then
    echo "install_chromium.sh: apt-get finished but /usr/bin/chromium is missing" >&2
    exit 1
fi
