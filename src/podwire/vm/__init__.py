"""Tiny QEMU VMs on podwire's tap ports, for the tests, the demo and an operator's checks.

``image`` builds, offline, a Debian kernel plus a busybox initramfs whose init brings up the
virtio NIC, asks for a DHCP lease and serves a command channel; ``launcher`` starts QEMU with
its NIC on a tap it creates inside a host's namespace, as libvirt does for
``<interface type='ethernet'>``. See docs/vm.md.
"""
