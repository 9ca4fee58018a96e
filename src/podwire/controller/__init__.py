"""The pool controller: pre-created, pre-bound Neutron ports handed out without a Neutron call."""
