"""Kubelet device plugin handing pods memif sockets (docs/deviceplugin.md)."""

from podwire.deviceplugin.model import MemifInfo, PodName
from podwire.deviceplugin.plugin import DevicePlugin

__all__ = ["DevicePlugin", "MemifInfo", "PodName"]
