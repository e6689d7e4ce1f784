"""The admin's user and role (group) pages, audited: every save and delete records the access fields
before and after (audit/access/events.py), in the admin view's own transaction."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.db import transaction

from core.auth import actor_for_user

from . import events as accounts

_BEFORE = "_audit_before"  # the object's snapshot taken in save_model, read in save_related


def _actor(request):
    return actor_for_user(request.user, request, component="admin")


class AuditedUserAdmin(UserAdmin):
    def save_model(self, request, obj, form, change):
        before = None
        if change and obj.pk is not None:
            before = accounts.user_snapshot(User.objects.get(pk=obj.pk))
        setattr(request, _BEFORE, before)
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)  # the groups are saved here
        user = form.instance
        accounts.record_user_change(
            actor=_actor(request),
            user_id=user.pk,
            before=getattr(request, _BEFORE, None),
            after=accounts.user_snapshot(user),
        )

    def delete_model(self, request, obj):
        before, pk = accounts.user_snapshot(obj), obj.pk
        super().delete_model(request, obj)
        accounts.record_user_change(actor=_actor(request), user_id=pk, before=before, after=None)

    def delete_queryset(self, request, queryset):
        # The "delete selected" action is not atomic by itself: the deletes and their audit are.
        with transaction.atomic():
            for user in queryset:
                self.delete_model(request, user)

    def user_change_password(self, request, id, form_url=""):
        if request.method != "POST":
            return super().user_change_password(request, id, form_url)
        with transaction.atomic():
            before = User.objects.filter(pk=id).values_list("password", flat=True).first()
            response = super().user_change_password(request, id, form_url)
            after = User.objects.filter(pk=id).values_list("password", flat=True).first()
            if before is not None and after != before:
                accounts.record_password_change(actor=_actor(request), user_id=int(id))
            return response


class AuditedGroupAdmin(GroupAdmin):
    """Groups are the roles (core/roles.py): renaming or deleting one changes what its members may do."""

    def save_model(self, request, obj, form, change):
        before = None
        if change and obj.pk is not None:
            before = accounts.role_snapshot(Group.objects.get(pk=obj.pk))
        setattr(request, _BEFORE, before)
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        accounts.record_role_change(
            actor=_actor(request),
            group_id=form.instance.pk,
            before=getattr(request, _BEFORE, None),
            after=accounts.role_snapshot(form.instance),
        )

    def delete_model(self, request, obj):
        before, pk = accounts.role_snapshot(obj), obj.pk
        super().delete_model(request, obj)
        accounts.record_role_change(actor=_actor(request), group_id=pk, before=before, after=None)

    def delete_queryset(self, request, queryset):
        with transaction.atomic():
            for group in queryset:
                self.delete_model(request, group)


for model, model_admin in ((User, AuditedUserAdmin), (Group, AuditedGroupAdmin)):
    if admin.site.is_registered(model):
        admin.site.unregister(model)
    admin.site.register(model, model_admin)
