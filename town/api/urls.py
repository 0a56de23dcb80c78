"""The API's URLs, mounted at /api/ by pokosite/urls.py (namespace "api")."""

from rest_framework.routers import DefaultRouter

from town.api import views

app_name = "api"

router = DefaultRouter()
router.register("towns", views.TownViewSet, basename="town")
router.register("places", views.PlaceViewSet, basename="place")
router.register("residents", views.ResidentViewSet, basename="resident")
router.register("runs", views.RunViewSet, basename="run")
router.register("ticks", views.TickViewSet, basename="tick")
router.register("decisions", views.DecisionViewSet, basename="decision")

urlpatterns = router.urls
