"""Storage for trial-and-error (docs/storage.md): environments packed once into shared,
content-addressed squashfs images (images.py, built by build.py as jobs); copy-on-write
trial workspaces over a read-only base (workspaces.py); the mounts both need where a job
starts (mounts.py); and the accounting of file-metadata operations on the paths an
admin marks as shared (meta.py). verbs.py is what the service calls."""

IMAGE_KEY, IMAGE_FILE, IMAGE_AT = "corral-image", "corral-image-file", "corral-image-at"
"""Labels of a job that runs from an image: its key, its file in the store, its mount point
on a node (a Slurm job mounts it there before its work)."""
META_LABEL = "corral-meta"
"""Label of a job sampled for metadata accounting: it runs under strace (meta.py)."""
WS_DIR, WS_LOWER = "corral-ws-dir", "corral-ws-lower"
"""Labels of a Slurm job that runs in a workspace: the workspace's directory (its layers,
on a filesystem the nodes share) and its lower layer; the job's batch script mounts the
overlay on the node it runs on (mounts.py ``workspace``) and releases it at the end."""
OWN_LABELS = (IMAGE_KEY, IMAGE_FILE, IMAGE_AT, META_LABEL, WS_DIR, WS_LOWER)
