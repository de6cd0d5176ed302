"""The HTTP edge: the app, its response models, and the bounds checked before authentication."""
