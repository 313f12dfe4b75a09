"""Device populations, their availability on the virtual clock, traces, and the cost model (Ray-free)."""

from .cost import CostCache, ModelCost, Spent, client_time, energy_j, measure, nbytes, round_duration, spent
from .population import Population
from .profile import DeviceProfile, DeviceState, builtin_profiles, configured_profile, load_profile, with_mix

__all__ = [
    "CostCache",
    "DeviceProfile",
    "DeviceState",
    "ModelCost",
    "Population",
    "Spent",
    "builtin_profiles",
    "client_time",
    "configured_profile",
    "energy_j",
    "load_profile",
    "measure",
    "nbytes",
    "round_duration",
    "spent",
    "with_mix",
]
