"""Device populations and the cost model of the virtual clock (Ray-free)."""

from .cost import CostCache, ModelCost, client_time, measure, nbytes, round_duration
from .profile import DeviceProfile, DeviceState, Population, builtin_profiles, configured_profile, load_profile, with_mix

__all__ = [
    "CostCache",
    "DeviceProfile",
    "DeviceState",
    "ModelCost",
    "Population",
    "builtin_profiles",
    "client_time",
    "configured_profile",
    "load_profile",
    "measure",
    "nbytes",
    "round_duration",
    "with_mix",
]
