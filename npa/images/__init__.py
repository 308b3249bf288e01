"""Images: resolve each tool's reference to a digest, verify its bootstrap contract, probe the
unattested ones once in the selected Kubernetes context, and cache what was proven."""
