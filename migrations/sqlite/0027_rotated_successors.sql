-- Rotations made before 0025 (`successor_id`) left the old text on its own budget for the
-- rest of its overlap, next to the new token's: the pair could spend both (s23 attack #3).
-- Each is found in the audit log (`token.rotate`: target `token:<old id>`, `after` naming
-- `new_token_id`) and the pair linked, so the old text works as the new token from here
-- on. A token an older version rotated more than once follows its latest rotation whose
-- new token is not revoked; one whose every new token was revoked is left alone: its old
-- text kept working on its own budget, and the link would end it unannounced.
UPDATE tokens SET successor_id = (
    SELECT CAST(json_extract(a.after, '$.new_token_id') AS INTEGER)
    FROM audit_log a
    WHERE a.action = 'token.rotate' AND a.target = 'token:' || tokens.id AND json_valid(a.after)
      AND CAST(json_extract(a.after, '$.new_token_id') AS INTEGER)
          IN (SELECT id FROM tokens WHERE revoked_at IS NULL)
    ORDER BY a.id DESC LIMIT 1)
WHERE successor_id IS NULL
  AND EXISTS (
    SELECT 1 FROM audit_log a
    WHERE a.action = 'token.rotate' AND a.target = 'token:' || tokens.id AND json_valid(a.after)
      AND CAST(json_extract(a.after, '$.new_token_id') AS INTEGER)
          IN (SELECT id FROM tokens WHERE revoked_at IS NULL));
