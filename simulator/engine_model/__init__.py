"""The engine as slotscope models it, apart from the fix under test: each backend's behaviour
(``BackendSpec``), a release's policies (``ReleaseBehaviour``), padding conventions, and the bug switches
of the radix cache's free paths (``SharingBehaviour``) and of the unified pool (``UnifiedBehaviour``)."""
