# SPDX-License-Identifier: GPL-3.0-or-later
"""Creates the identities the Keystone tests use, in a Keystone made by `keystone-manage bootstrap`
(tests/netns/src/keystone.rs), through Keystone's own API as the bootstrap admin:

- project `service`, and user `ironguard` with the `service` role on it: the identity ironguard's inspector API
  validates callers' tokens with (`[inspector_api] keystone_username`);
- user `viewer` with the `reader` role on project `admin` only: a valid token without an operator role.

usage: keystone_users.py AUTH_URL ADMIN_PASSWORD SERVICE_PASSWORD VIEWER_PASSWORD
"""
import sys

from keystoneauth1 import session
from keystoneauth1.identity import v3
from keystoneclient.v3 import client


def main():
    url, admin_password, service_password, viewer_password = sys.argv[1:5]
    auth = v3.Password(auth_url=url, username="admin", password=admin_password, project_name="admin",
                       user_domain_id="default", project_domain_id="default")
    ks = client.Client(session=session.Session(auth=auth))

    def role(name):
        found = ks.roles.list(name=name)
        return found[0] if found else ks.roles.create(name)

    service = ks.projects.create("service", "default")
    ironguard = ks.users.create("ironguard", domain="default", password=service_password, default_project=service)
    ks.roles.grant(role("service"), user=ironguard, project=service)
    viewer = ks.users.create("viewer", domain="default", password=viewer_password)
    admin = ks.projects.list(name="admin")[0]
    ks.roles.grant(role("reader"), user=viewer, project=admin)
    print("identities created")


if __name__ == "__main__":
    main()
