# SPDX-License-Identifier: GPL-3.0-or-later
"""Keystone's public WSGI application, for gunicorn (tests/netns/src/keystone.rs).

keystone.wsgi.api reads its configuration with oslo.config, which would take gunicorn's own command line as
Keystone's: the arguments are dropped first. The configuration comes from OS_KEYSTONE_CONFIG_FILES.
"""
import sys

sys.argv = sys.argv[:1]

from keystone.wsgi.api import application  # noqa: E402,F401
