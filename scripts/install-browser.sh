#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver for the end-to-end browser test (needs root and apt).
# Playwright drives this system browser; it never downloads one of its own.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
/usr/bin/chromium --version
