"""KV tiers below the device pool: host memory, then a disk directory (SGLang HiCache's L2/L3,
LMCache's local CPU and disk backends, vLLM's offloading connector).

A full block, once computed, is copied out of the device pool at the end of its step and
written down the tiers by a background thread (writer); a request whose chain misses the
device pool is looked up in host memory, then on disk, by a load thread, and waits (skipped by
the scheduler) until the longest run of consecutive blocks found is installed into the pool
(offloader). Blocks are keyed by their chain hash (parent, tokens, model fingerprint, cache
salt), so they can be shared by every engine of a deployment; files carry a header and a MAC
under the deployment's key (block_file), are opened without following links or opening
special files (safe_files), and are never trusted without both checks; a read that does not
come back is given up (loader, offloader) and a tier that keeps failing is turned off.
"""
