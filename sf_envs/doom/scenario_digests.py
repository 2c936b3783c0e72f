"""SHA-256 digests, pinned in the repository, of the Sample Factory Doom scenario data.

Pure data. `python -m sf_envs.doom.fetch_scenarios` refuses a wheel whose sha256 is not WHEEL_SHA256 and
every extracted file whose digest is not in FILES; a Doom env that uses fetched data checks its .cfg and
.wad files against FILES when it is made (sf_envs/doom/scenario_check.py). Nothing here is read from the
wheel or from the data directory: a forged wheel or a MANIFEST.json written next to forged files changes
nothing.

How they were computed: `pip download --no-deps --only-binary=:all: sample-factory==2.1.1` from PyPI gave
sample_factory-2.1.1-py3-none-any.whl (9015629 bytes), whose sha256 below equals the one PyPI publishes
for that file (https://pypi.org/simple/sample-factory/); FILES are `hashlib.sha256` of each member
sf_examples/vizdoom/doom/scenarios/<name> of that wheel (and of sample_factory-2.1.1.dist-info/LICENSE,
extracted as LICENSE.sample-factory), and each agrees with the wheel's own RECORD.
"""

SF_PACKAGE = "sample-factory"
SF_VERSION = "2.1.1"
WHEEL_NAME = "sample_factory-2.1.1-py3-none-any.whl"
WHEEL_SHA256 = "4acaef95c3790f4328bf839e07631737879f3c6409d22ee6e5d67635db8482a7"
WHEEL_SIZE = 9015629

# extracted file name -> (sha256, size in bytes)
FILES = {
    "basic.cfg": ("f228ec8f3e0f7d3b2446c1c0a5bb84f7a18bc0a6babfa1a6c2566b80242416f8", 924),
    "basic.wad": ("fd0b7e5e2422e09288c786e7fc32181bb8ee4a3faa613a75ef88a3e39b5ce94e", 2704),
    "battle.cfg": ("b9c82c83437b5dc5e906c94548b2b36f5ee26884bceeea2e0f77d0353f2f7dab", 1078),
    "battle.wad": ("b29b461995ae7035095a5283c57ef13393e6839326754e94f5b80af5f07e5484", 15496),
    "battle2.wad": ("0851ae13490433b1e335d427dd391b3e0a6a33a97a16c0190579a2820935e522", 82549),
    "battle2_continuous_turning.cfg": ("12948c89244a8b52917d85f9ecbc79287a33280d500aaffb3fc16d0b31997656", 1006),
    "battle_continuous_turning.cfg": ("04960c2d14dfe5a30fc57117314fa9f82f2d658d1f8ed23b8b45a74e1c5b4584", 1071),
    "cig.cfg": ("af6b9bc7a48fb9157a5c7172778f49d624452e30ecc1412a71ab6cf4d7713e48", 1052),
    "cig.wad": ("3ae9dadec22a494e7644a5fcd9abc0595e16d49b29635e2b0be625395d46859d", 214730),
    "deadly_corridor.cfg": ("b73d17238af5411f35262117a21cbf063a0e15882692f8201176c09277181889", 891),
    "deadly_corridor.wad": ("3c868f88c78df8219a2c41a2695ae04e5a19d60a32f1718282b3bbc7f20951ca", 10048),
    "defend_the_center.cfg": ("d87d5039998aedb340c938291d593b95f60999482c84284b3e25a663a9ff316e", 901),
    "defend_the_center.wad": ("eb3f8d3b3f456bbef32a1d41f847189dd83cc1d4e320157ba92b75a9b0d8d5bb", 6478),
    "defend_the_line.cfg": ("a52f6a23b25821e76791827760c1d788522fc3bb842b8418b9ac891e884bd892", 825),
    "defend_the_line.wad": ("b1d0fc43d987eee9e1dfee0e6bdecde8cf1ce5b15b9a09f79751bd73c553f3d8", 4139),
    "dwango5.wad": ("2b7658f126321fc2ccf953dbbe8d585b4162350080b9715b46fc617d32cdb13a", 2109396),
    "dwango5_dm.cfg": ("e918b8964899fe4d909b694cc73f08563fe9b805c1aecbb0b74d348366052ab8", 1469),
    "dwango5_dm_continuous_weap.cfg": ("6eb842f220dc3153155a1963732887efd24745b33e10ac515233f8cce6f02044", 1569),
    "freedm.cfg": ("b33db989820642a029416f0209c157a0c0936ce45ebf2a9069865a51cc96be95", 1580),
    "freedm.wad": ("c0b998f0ebd0ce343d56e584546a0d3e177bd7e98e13abecd77e2c00dcd15426", 21112116),
    "health_gathering.cfg": ("1379d79c65a0c5aa9a67cedbcaf8c9efb668bb988833de9823d8cc269995c416", 1044),
    "health_gathering.wad": ("c77c8ba3254ae19eaff8d00418870a7718ef8a5822e5872ab68b76205cb2bacf", 2837),
    "health_gathering_supreme.cfg": ("9ffd12df2575b06acbd156790468a3dbb3fbbce7377b2c73cdffff16f77b0974", 868),
    "health_gathering_supreme.wad": ("a3ecd9d0611c72973923994e96a26df0cfb5e93dfeab8ee734cfb921a94fd029", 23206),
    "my_way_home.cfg": ("a07730dcda3d5860cb67583695b70f588f63388e544e35733e5ed993d0dd5dbf", 947),
    "my_way_home.wad": ("18e98ff4c9186808eb00696b799cfe88a79e7486429c1692aafbed8ef359c0b1", 28469),
    "ssl2.cfg": ("f2ad91c6265dcdd3ca16670d895d314b464db429a59a6dd75a3aa08734a7828d", 1578),
    "ssl2.wad": ("3a3165f3cc3e34ede782e2cb2e986802dba641a19ccf2bb8b65f60065f86a601", 330798),
    "two_colors_easy.cfg": ("3d54be096385cffd0edb685ca43704d39fcfa9adffde2e6806e27aab98770d6e", 864),
    "two_colors_easy.wad": ("7fe0a1285cf4cd39d4e890ffc91f824131c6667b4d0c26d3bfb6b1ed568c8d8e", 4810),
    "two_colors_hard.cfg": ("03092be72fcc6299666680bc96fb3e1137799b519818e78a81f8d1533c846e88", 864),
    "two_colors_hard.wad": ("fd0cfe76c54b8ad7b95262aab4d284b08ffeb86af5c24c100045c093ca843822", 5096),
    "LICENSE.sample-factory": ("8ab6a2519c47c858335fc4344b730fd18644251e5bf780d4e8115870f1735696", 1073),
}
