"""Operations that apply a plan to hosts: deploy, rollback (launch/verify arrive later)."""
