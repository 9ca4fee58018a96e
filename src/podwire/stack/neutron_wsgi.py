"""WSGI entry point for neutron-server under gunicorn.

Neutron's own ``neutron.wsgi.api`` parses ``sys.argv`` with oslo.config, which would choke on
gunicorn's arguments, so argv is cleared before it is imported. The config location comes from
the ``OS_NEUTRON_CONFIG_*`` variables the stack sets.
"""

import sys

sys.argv = sys.argv[:1]

from neutron import policy  # noqa: E402
from neutron.wsgi import api  # noqa: E402

# Loading the policy before serving avoids a race in which concurrent first requests
# each start loading it and some get a spurious 403.
policy.init()

application = api.application
