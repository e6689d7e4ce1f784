import json

from django.core.management.base import BaseCommand, CommandError

from audit.anchors.signing import public_pem, signing_key
from audit.anchors.write import AnchorRefused, write_anchor


class Command(BaseCommand):
    help = (
        "Sign the audit chain head (seq, hash, time) with Ed25519 and append it to the anchor sink "
        "(ANCHOR_DIR by default). --public-key prints the PEM public key to verify anchors with."
    )

    def add_arguments(self, parser):
        parser.add_argument("--public-key", action="store_true", help="print the public key only")

    def handle(self, *args, public_key, **opts):
        if public_key:
            self.stdout.write(public_pem(signing_key().public_key()), ending="")
            return
        try:
            record = write_anchor()
        except AnchorRefused as exc:
            raise CommandError(f"no anchor written: {exc}")
        self.stdout.write(json.dumps(record))
