from django.urls import path
from gram import views

urlpatterns = [
    path("users", views.create_user),
    path("users/<int:user_id>/photos", views.photos),
    path("photos/<int:photo_id>", views.photo),
    path("photos/<int:photo_id>/likes", views.like),
]
