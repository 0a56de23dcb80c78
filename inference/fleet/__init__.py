"""The node fleet: the deployment's nodes and their Celery queues (nodes.py), sending to them
(task_queue.py), a node worker's lifecycle (worker.py), the nodes' heartbeats (health.py), and
which node a request goes to (router.py over the prompt prefixes each node served, prefixes.py;
services.py routes a batch). The town reaches it through inference/services.py."""
