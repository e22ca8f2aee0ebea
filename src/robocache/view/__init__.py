"""Looking at episodes: every stream on one time axis, as the source recorded it and as aligned.

:func:`~robocache.view.episodes.open_view` opens a RoboCache cache or any dataset the readers
open (:func:`robocache.data.formats.open_source`) and gives, per episode, an
:class:`~robocache.view.episodes.EpisodeView`: the native streams (each at its own sample
times), the aligned grid (a cache's rows, or a source aligned on the fly at a chosen rate) and
camera frames in chunks. :mod:`robocache.view.record` logs those to a Rerun recording
(``robocache view``); :mod:`robocache.view.plot` draws one episode as a static picture
(``robocache inspect --plot``).
"""
