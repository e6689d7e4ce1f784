from axes.management.commands.axes_reset_ip_username import Command as AxesCommand

from ._axes_reset import reset_and_report


class Command(AxesCommand):
    help = "Reset all access attempts and lockouts for a given IP address and username (audited)"

    def handle(self, *args, **options):
        reset_and_report(
            self, "axes_reset_ip_username", ip=options["ip"], username=options["username"]
        )
