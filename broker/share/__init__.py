"""Share groups (issue #32, KIP-932): share-partition state and share-group membership."""

__all__: list[str] = []
