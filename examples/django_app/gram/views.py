"""JSON views: the models route by key or ID; a transaction names its shard."""

import json

from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt

import shardctl.django

from .models import Like, Photo, User


@csrf_exempt
def create_user(request):
    user = User.objects.create(username=json.loads(request.body)["username"])
    return JsonResponse({"id": user.id})


@csrf_exempt
@shardctl.django.retry_on_move  # again, once, if the owner's shard moved during the transaction
def photos(request, user_id):
    if request.method == "POST":
        caption = json.loads(request.body)["caption"]
        # one transaction on the owner's shard (table=: a user's ID from before an adoption needs it)
        with shardctl.django.atomic(id=user_id, table="users"):
            photo = Photo.objects.create(user_id=user_id, caption=caption)
            count = Photo.objects.filter(user_id=user_id).count()
        return JsonResponse({"id": photo.id, "photos": count})
    rows = Photo.objects.filter(user_id=user_id).order_by("-id").values_list("id", "caption")
    return JsonResponse({"photos": [list(row) for row in rows]})


def photo(request, photo_id):
    try:
        p = Photo.objects.get(pk=photo_id)
    except Photo.DoesNotExist:
        raise Http404 from None
    likes = Like.objects.filter(photo_id=photo_id).count()
    return JsonResponse({"id": p.id, "user_id": p.user_id, "caption": p.caption, "likes": likes})


@csrf_exempt
def like(request, photo_id):
    Like.objects.get_or_create(photo_id=photo_id, user_id=json.loads(request.body)["user_id"])
    return JsonResponse({"likes": Like.objects.filter(photo_id=photo_id).count()})
