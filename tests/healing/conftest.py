"""The healing suite combines the fixtures of the suites whose components it stalls."""

from tests.controller.conftest import http, network, nodes  # noqa: F401
from tests.etcd.conftest import private_etcd  # noqa: F401
from tests.ml2.test_forwarder import own_journal  # noqa: F401
