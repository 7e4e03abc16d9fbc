"""Compatibility only: placeholders for Monarch's ``monarch._rust_bindings.monarch_hyperactor.pickle``
(its runtime's message pickling and the counters its tests read: see ``monarch._src._placeholder``);
monarch's ``flatten``/``unflatten`` are ``monarch._src.actor.pickle``'s."""

from monarch._src._placeholder import placeholder, placeholder_function

PendingMessage = placeholder(__name__, "PendingMessage")
pickle = placeholder_function(__name__, "pickle")
_get_mesh_pop_count = placeholder_function(__name__, "_get_mesh_pop_count")
_reset_mesh_pop_count = placeholder_function(__name__, "_reset_mesh_pop_count")
_get_pending_reserve_count = placeholder_function(__name__, "_get_pending_reserve_count")
_reset_pending_reserve_count = placeholder_function(__name__, "_reset_pending_reserve_count")
del placeholder, placeholder_function
