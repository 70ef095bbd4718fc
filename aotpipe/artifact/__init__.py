"""The artefact format: write, read safely, manifest, blobs, .input, fingerprints."""
