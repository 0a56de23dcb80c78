"""The town's REST API (Django REST framework): thin viewsets over town services and selectors."""
