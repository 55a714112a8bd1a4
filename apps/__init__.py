"""What people run: the `vit-keras` command line and the demo classifier (terminal and web)."""
