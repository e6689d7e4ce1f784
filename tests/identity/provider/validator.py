from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """Every claim to everyone (a test IdP): the username, e-mail and the user's groups."""

    oidc_claim_scope = None

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    # prompt=none (the controlplane's session refresh): oauthlib asks these; DOT leaves them unimplemented.
    # The authorize view already required a signed-in user, and the client skips the consent page.
    def validate_silent_login(self, request):
        return True  # DOT's authorize view is login-required: an anonymous browser never gets here

    def validate_silent_authorization(self, request):
        return True

    def validate_user_match(self, id_token_hint, scopes, claims, request):
        return True
