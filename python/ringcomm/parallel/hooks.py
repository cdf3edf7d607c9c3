"""Tensor hooks that do not keep their owner alive.

A hook registered on a tensor (``register_post_accumulate_grad_hook``, or
``register_hook`` on a tensor of the autograd graph) is held by torch's C++ side,
which Python's garbage collector cannot see through. A bound method there makes a
cycle the collector never frees: parameter -> hook -> wrapper -> module -> parameter.
A process that builds DataParallel, ZeroDataParallel or a memory probe again and
again (a layout search, a sweep, an elastic restart) then keeps every earlier model,
its gradients and optimizer state: tens of MB per model.

``weak_hook(obj.method)`` is the hook to register instead: it calls the method while
its object lives and does nothing once it is gone, so the wrapper goes away with its
last reference (as torch's own DistributedDataParallel, whose C++ reducer the hooks
reach through a weak pointer).
"""
import weakref

__all__ = ["weak_hook"]


def weak_hook(method, *bound):
    """A hook calling ``method(*bound, *args)`` while method's object lives, a no-op
    (returning None: the gradient unchanged) after."""
    ref = weakref.WeakMethod(method)

    def hook(*args):
        fn = ref()
        if fn is not None:
            return fn(*bound, *args)
        return None

    return hook
