from axes.management.commands.axes_reset_ip import Command as AxesCommand

from ._axes_reset import reset_and_report


class Command(AxesCommand):
    help = "Reset all access attempts and lockouts for given IP addresses (audited)"

    def handle(self, *args, **options):
        for ip in options["ip"]:
            reset_and_report(self, "axes_reset_ip", ip=ip)
